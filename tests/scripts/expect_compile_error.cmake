# Builds TARGET in BUILD_DIR; passes when the build fails with one error, whose output contains EXPECT.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${TARGET} failed without saying \"${EXPECT}\":\n${out}${err}")
endif()
# One error: the sentence, not a cascade after it.
string(REGEX MATCHALL "error: " errors "${out}${err}")
list(LENGTH errors n)
if(n GREATER 1)
  message(FATAL_ERROR "${TARGET} failed with ${n} errors; the sentence must be the only one:\n${out}${err}")
endif()
message("${TARGET} failed to compile with: ${EXPECT}")
