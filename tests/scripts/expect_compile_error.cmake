# Builds TARGET in BUILD_DIR; passes when the build fails and its output contains EXPECT.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${TARGET} failed without saying \"${EXPECT}\":\n${out}${err}")
endif()
message("${TARGET} failed to compile with: ${EXPECT}")
