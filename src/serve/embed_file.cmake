# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed_file.cmake
# Writes IN's bytes as a C array NAME[] (NUL-terminated, not counted) and
# NAME_size: the chat page is served from memory, with no file at run time.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR size "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
# 16 bytes a line keeps the generated file readable by diff tools.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by embed_file.cmake; do not edit. */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {\n${body}0x00};\n"
  "const size_t ${NAME}_size = ${size};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
