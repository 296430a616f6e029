// The library version, kept in step with project(VERSION) in CMakeLists.txt.
#pragma once

#define TSHARD_VERSION_MAJOR 0
#define TSHARD_VERSION_MINOR 1
#define TSHARD_VERSION_PATCH 0
#define TSHARD_VERSION_STRING "0.1.0"
