// SPDX-License-Identifier: Apache-2.0
#pragma once

/// squall's version; CMake reads these three lines, so they are the one place it is set.
#define SQUALL_VERSION_MAJOR 0
#define SQUALL_VERSION_MINOR 1
#define SQUALL_VERSION_PATCH 0

namespace squall {
/// The version as one number, major * 10000 + minor * 100 + patch.
inline constexpr int version =
    SQUALL_VERSION_MAJOR * 10000 + SQUALL_VERSION_MINOR * 100 + SQUALL_VERSION_PATCH;
}  // namespace squall
