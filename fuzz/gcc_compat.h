/* Force-included into the library's sources in the fuzz build only: clang
 * has no __builtin_shuffle (GCC's two-vector shuffle with a mask vector,
 * used by src/backend/cpu/cpu_attention.c), so spell it out lane by lane,
 * with GCC's meaning (mask values index the concatenation a ++ b). */
#ifndef DS_FUZZ_GCC_COMPAT_H
#define DS_FUZZ_GCC_COMPAT_H

#if defined(__clang__) && !__has_builtin(__builtin_shuffle)
#define __builtin_shuffle(a, b, mask)                                                       \
    __extension__({                                                                       \
        __typeof__(a) ds_sa_ = (a), ds_sb_ = (b), ds_sr_;                                  \
        const int ds_sn_ = (int)(sizeof ds_sa_ / sizeof ds_sa_[0]);                        \
        for (int ds_si_ = 0; ds_si_ < ds_sn_; ds_si_++) {                                  \
            int ds_sm_ = (int)(mask)[ds_si_] & (2 * ds_sn_ - 1);                           \
            ds_sr_[ds_si_] = ds_sm_ < ds_sn_ ? ds_sa_[ds_sm_] : ds_sb_[ds_sm_ - ds_sn_];      \
        }                                                                                 \
        ds_sr_;                                                                           \
    })
#endif

#endif
