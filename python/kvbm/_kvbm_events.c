#include "_kvbm.h"
PyTypeObject *kvbmpy_EventBatchType;
int kvbmpy_events_init(PyObject *m) { (void)m; return 0; }
