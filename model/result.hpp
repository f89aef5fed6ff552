// model/result.hpp: forwards to <cellshard/result.hpp> (target cellshard::base),
// where result<T>, error and error_code live, so that the layers below
// supervision/ and the public API share one error type.
#pragma once

#include <cellshard/result.hpp>
