#include "_kvbm.h"
int kvbmpy_router_init(PyObject *m) { (void)m; return 0; }
