// SPDX-License-Identifier: Apache-2.0
// The one doctest main of the host and CUDA test executables.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
