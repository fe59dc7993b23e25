// TEMPORARY (until the CPU backend lands on main): a ModelBackend over forward() with one State
// per slot, so the server runs the real model meanwhile. Removed at the merge.
#pragma once
#include "engine/backend.h"

namespace cm::serve {
std::unique_ptr<ModelBackend> make_forward_backend(const Model& m);
}
