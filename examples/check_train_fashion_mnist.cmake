# SPDX-License-Identifier: Apache-2.0
# ctest example.train_fashion_mnist: trains 2 epochs on 2 ranks, dense and top-k 1% with error
# feedback, and fails unless both runs end at a test accuracy >= FLOOR and with weights
# identical on every rank (the example's exit code says so).
file(REMOVE ${CSV})
execute_process(COMMAND ${EXE} -n 2 --epochs 2 --train-subset 12000 --test-subset 2000
                        --compressor none,topk:0.01+ef --csv ${CSV}
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "train_fashion_mnist exited with ${status}")
endif()
file(STRINGS ${CSV} rows)
set(finals "")
foreach(row IN LISTS rows)
  string(REPLACE "," ";" f "${row}")
  list(GET f 0 compressor)
  list(GET f 3 epoch)
  if(epoch STREQUAL "2")
    list(GET f 5 accuracy)
    list(APPEND finals "${compressor}=${accuracy}")
    if(accuracy LESS FLOOR)
      message(FATAL_ERROR "${compressor}: test accuracy ${accuracy} after 2 epochs, below ${FLOOR}")
    endif()
  endif()
endforeach()
list(LENGTH finals n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "expected the final epoch of 2 runs in ${CSV}, found: ${finals}")
endif()
message(STATUS "final test accuracies: ${finals} (floor ${FLOOR})")
