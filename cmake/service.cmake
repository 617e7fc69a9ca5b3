# SPDX-License-Identifier: Apache-2.0
# service: the HTTP service layer (src/service/). Its test runs a server
# thread against client sockets, so it also runs under ThreadSanitizer.
if(TEST service_test_service)
  set_tests_properties(service_test_service PROPERTIES LABELS "service;tsan" TIMEOUT 120)
endif()
if(TEST service_test_defer)
  set_tests_properties(service_test_defer PROPERTIES LABELS "service;tsan" TIMEOUT 60)
endif()
