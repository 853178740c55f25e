// The environment of the tests that start MPI ranks (mpirun, or the launcher's local cluster
// through it): one OpenMP thread per rank, root allowed to start ranks (CI containers run as
// root), oversubscription of the CI's two cores, and, for the asan suite, LeakSanitizer told
// about Open MPI's own allocations (tests/lsan_open_mpi.supp). Harmless without sanitizers.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace test_support {

inline std::vector<std::string> mpi_test_environment() {
  return {"OMP_NUM_THREADS=1",
          "OMPI_ALLOW_RUN_AS_ROOT=1",
          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
          "OMPI_MCA_rmaps_base_oversubscribe=1",
          std::string("LSAN_OPTIONS=fast_unwind_on_malloc=0:suppressions=") + TEST_SOURCE_DIR +
              "/tests/lsan_open_mpi.supp"};
}

// The same set in this process's environment, for a test that starts ranks through a program
// that passes its environment on (the launcher); the test's process ends with its test case.
inline void use_mpi_test_environment() {
  for (const std::string& entry : mpi_test_environment()) {
    const size_t equals = entry.find('=');
    setenv(entry.substr(0, equals).c_str(), entry.substr(equals + 1).c_str(), 1);
  }
}

}  // namespace test_support
