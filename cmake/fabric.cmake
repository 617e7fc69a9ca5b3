# Fabric (src/fabric): extra test settings.
# The in-process fabric test drives the two ends from two threads: run it
# under ThreadSanitizer as well.
if(TARGET fabric_test_inproc)
  set_tests_properties(fabric_test_inproc PROPERTIES LABELS "fabric;tsan")
endif()
