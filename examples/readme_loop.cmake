# docs/library.md shows examples/fsdp.c's training loop inline; this keeps them
# the same. From the optimizer config to the loop's closing brace, indented
# by 4 in the file and by 0 in the page:
#   cmake -DSRC=examples/fsdp.c -DREADME=docs/library.md -P examples/readme_loop.cmake
file(READ ${SRC} src)
string(FIND "${src}" "    fsc_optim_config adamw" begin)
if(begin EQUAL -1)
  message(FATAL_ERROR "${SRC}: no line starting 'fsc_optim_config adamw'")
endif()
string(SUBSTRING "${src}" ${begin} -1 rest)
string(FIND "${rest}" "\n    }\n" end)
math(EXPR end "${end} + 7")
string(SUBSTRING "${rest}" 0 ${end} loop)
# dedent by 4 (a plain replace: CMake's regex matches "^" wherever a search resumes)
string(REPLACE "\n    " "\n" loop "\n${loop}")
string(SUBSTRING "${loop}" 1 -1 loop)
file(READ ${README} readme)
string(FIND "${readme}" "```c\n${loop}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${README} does not show the loop of ${SRC} as it is in the file:\n${loop}")
endif()
message(STATUS "${README} shows the loop of ${SRC} (${end} bytes)")
