// Sharded operators against serial references (issue 3).
#include "test_support.hpp"
