// Parallelism strategies that do not depend on a model's code: data-parallel gradient buckets and
// ZeRO, pipeline schedules and their runner, layout plans.
#pragma once
#include "tshard/parallel/bucket.hpp"
#include "tshard/parallel/megatron.hpp"
#include "tshard/parallel/micro_batch.hpp"
#include "tshard/parallel/pipeline.hpp"
#include "tshard/parallel/prefetch.hpp"
#include "tshard/parallel/schedule.hpp"
