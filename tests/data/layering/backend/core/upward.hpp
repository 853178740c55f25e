// A file of backend/core/ that includes a header of a folder above it: the layering check
// (backend/check_layering.cmake) must refuse it by name. Never compiled.
#pragma once

#include "backend/common/error.hpp"
#include "backend/ops/linear.hpp"
