# embed_haystack.cmake - turns the haystack data files (data/haystack: essay.txt, the prose; nouns.txt,
# adjectives.txt, verbs.txt, vocabulary.txt, one word a line) into a C source with the arrays that
# src/eval/haystack.h declares. Run at build time: cmake -DDATA_DIR=... -DOUT=... -P embed_haystack.cmake
if(NOT DATA_DIR OR NOT OUT)
  message(FATAL_ERROR "embed_haystack.cmake: set DATA_DIR and OUT")
endif()

set(src "/* haystack_data.c - GENERATED at build time by cmake/embed_haystack.cmake from the files of data/haystack;\n")
string(APPEND src " * do not edit. The prose and word lists are from \"The Devil's Dictionary\" by Ambrose Bierce (1911),\n")
string(APPEND src " * public domain (see tools/oracle/haystack_text.py). Data only: no code. */\n")
string(APPEND src "#include \"eval/haystack.h\"\n\n")

file(READ "${DATA_DIR}/essay.txt" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR n_bytes "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(APPEND src "const char ckv_haystack_essay_text[] = {\n    ${bytes}0x00};\n")
string(APPEND src "const unsigned long ckv_haystack_essay_len = ${n_bytes}ul;\n")

foreach(list nouns adjectives verbs vocabulary)
  file(STRINGS "${DATA_DIR}/${list}.txt" words)
  list(LENGTH words n)
  string(APPEND src "\nconst char *const ckv_haystack_${list}[] = {\n")
  foreach(w IN LISTS words)
    string(REPLACE "\\" "\\\\" w "${w}")
    string(REPLACE "\"" "\\\"" w "${w}")
    string(APPEND src "    \"${w}\",\n")
  endforeach()
  string(APPEND src "};\nconst int ckv_haystack_${list}_count = ${n};\n")
endforeach()

file(WRITE "${OUT}.tmp" "${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
