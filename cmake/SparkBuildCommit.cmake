# Writes OUT (a header defining SPARK_GIT_COMMIT, the checkout's short commit or "unknown") at every
# build, touching it only when the commit changed, so only what includes it recompiles.
# Run as: cmake -DSOURCE_DIR=... -DOUT=... -P SparkBuildCommit.cmake
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --short HEAD
                    OUTPUT_VARIABLE out RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(rc EQUAL 0 AND out)
        set(commit "${out}")
        execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
        if(NOT dirty EQUAL 0)
            string(APPEND commit "-dirty")
        endif()
    endif()
endif()
set(text "#define SPARK_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
    file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
    file(WRITE ${OUT} "${text}")
endif()
