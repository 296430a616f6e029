# Runs COMMAND and passes when it exits non-zero within MAX_SECONDS: a failure on one rank
# must end the whole job quickly, never leave it hanging. With EXPECT (a regex), its output must
# also say so.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(TIMESTAMP stop "%s")
math(EXPR elapsed "${stop} - ${start}")
message("exit code ${rc} after ${elapsed} s")
if(rc EQUAL 0)
  message(FATAL_ERROR "the run succeeded, but one rank failed on purpose:\n${out}\n${err}")
endif()
if(elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "the failing run took ${elapsed} s (limit ${MAX_SECONDS} s):\n${err}")
endif()
if(DEFINED EXPECT AND NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not say '${EXPECT}':\n${out}\n${err}")
endif()
message("${err}")
