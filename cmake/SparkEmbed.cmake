# cmake -DIN=file -DOUT=header.h -DNAME=kName -P SparkEmbed.cmake
# Writes header.h with `inline constexpr char kName[] = {...bytes..., 0};` (a file compiled into a
# program, e.g. spark-server's chat page). Bytes, not a string literal: no escaping, no length limit.
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
file(WRITE ${OUT}.tmp "// Generated from ${IN} by cmake/SparkEmbed.cmake. Do not edit.\n#pragma once\n"
                      "inline constexpr char ${NAME}[] = {${bytes}0};\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
