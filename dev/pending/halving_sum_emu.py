import numpy as np
rng=np.random.default_rng(1)
for trial in range(200):
    # P[l][o]: lane l's partial for output o (32 outputs), float32
    P=rng.standard_normal((32,32)).astype(np.float32)*np.float32(10)**rng.integers(-3,4,(32,32)).astype(np.float32)
    # reference: butterfly per output: v_l = P[l][o]; for off in 16..1: v_l += v_{l^off}
    ref=np.zeros(32,np.float32)
    for o in range(32):
        v=P[:,o].copy()
        for off in (16,8,4,2,1):
            v=np.array([np.float32(v[l]+v[l^off]) for l in range(32)],np.float32)
        ref[o]=v[o]  # lane o's value (all lanes equal up to commutativity)
    # old halving (with selects): lane l register p[i] holds output i
    p=[[P[l][i] for i in range(32)] for l in range(32)]
    for W in (16,8,4,2,1):
        newp=[row[:] for row in p]
        for l in range(32):
            hi = l & W
            for i in range(W):
                send_partner = p[l^W][i] if (l^W)&W else p[l^W][i+W]
                keep = p[l][i+W] if hi else p[l][i]
                newp[l][i]=np.float32(keep+send_partner)
        p=newp
    old=np.array([p[l][0] for l in range(32)],np.float32)
    # new: lane l register i holds output i^l
    q=[[P[l][i^l] for i in range(32)] for l in range(32)]
    for W in (16,8,4,2,1):
        newq=[row[:] for row in q]
        for l in range(32):
            for i in range(W):
                newq[l][i]=np.float32(q[l][i]+q[l^W][i+W])
        q=newq
    new=np.array([q[l][0] for l in range(32)],np.float32)
    assert (old.view(np.uint32)==ref.view(np.uint32)).all(), ("old",trial)
    assert (new.view(np.uint32)==ref.view(np.uint32)).all(), ("new",trial)
print("ok: old and new halving sums equal the butterfly bit for bit over 200 trials")
