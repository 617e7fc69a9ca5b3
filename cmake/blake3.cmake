# SPDX-License-Identifier: Apache-2.0
# blake3: the threaded test also runs under ThreadSanitizer (it proves the
# module shares no mutable state between hashers).
if(TEST blake3_test_threads)
  set_tests_properties(blake3_test_threads PROPERTIES LABELS "blake3;tsan")
endif()
# The pool test hashes from several threads on the pool's workers: also
# under ThreadSanitizer.
if(TEST blake3_test_pool)
  set_tests_properties(blake3_test_pool PROPERTIES LABELS "blake3;tsan")
endif()
