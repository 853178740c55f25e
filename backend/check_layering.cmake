# The layering check (backend/CMakeLists.txt): fails when a file of backend/<dir>/ includes a
# header of a folder that <dir>'s line of the table does not list, naming the file, the line
# and what the folder may use. Run as
#   cmake -DTABLE=<table> -DROOT=<source root> [-DSTAMP=<file touched on success>] -P check_layering.cmake
# The table has one line per folder: the folder, then every folder its files may include.
cmake_minimum_required(VERSION 3.25)
if(NOT TABLE OR NOT ROOT)
  message(FATAL_ERROR "check_layering.cmake needs -DTABLE=<table> and -DROOT=<source root>")
endif()
file(STRINGS "${TABLE}" lines)
set(problems "")
foreach(line IN LISTS lines)
  string(REPLACE " " ";" allowed "${line}")
  list(POP_FRONT allowed folder)
  file(GLOB files "${ROOT}/backend/${folder}/*.hpp" "${ROOT}/backend/${folder}/*.cpp"
    "${ROOT}/backend/${folder}/*.cu" "${ROOT}/backend/${folder}/*.cuh")
  foreach(file IN LISTS files)
    file(STRINGS "${file}" includes REGEX "^#include \"backend/")
    foreach(include IN LISTS includes)
      string(REGEX MATCH "^#include \"backend/(.+)/[^/]+\"" matched "${include}")
      if(NOT matched)
        continue()
      endif()
      set(used "${CMAKE_MATCH_1}")
      if(NOT used IN_LIST allowed)
        file(RELATIVE_PATH shown "${ROOT}" "${file}")
        string(REPLACE ";" ", " listed "${allowed}")
        string(APPEND problems
          "\n  ${shown}: ${include}: backend/${folder}/ may include only backend/{${listed}}/")
      endif()
    endforeach()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "upward includes (docs/architecture.md, \"Rules that keep the shape\"):"
    "${problems}\nMove the code down, or pass what the lower folder needs as a plain value.")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()
