#include "_kvbm.h"
int kvbmpy_pool_init(PyObject *m) { (void)m; return 0; }
