// CPU threading defaults of the clawmine binary. The CPU backend runs many
// short OpenMP parallel regions per token; libgomp's default lets idle threads
// spin, which costs little on an idle machine but makes a run 10x slower when
// other processes share the cores (the spinning thread holds the core that the
// thread it waits for needs). The binary therefore sets the waiting policy
// itself (passive: idle threads sleep) and picks the thread count from the
// cores that are free when it starts.
#pragma once

namespace cm::cli {

// libgomp reads OMP_WAIT_POLICY once, in its own constructor, before main(),
// and has no call to change it later; a setenv() from an ELF .preinit_array
// function is undone by libc's own initialisation (which resets environ to
// the original envp). So the binary re-executes itself once with
// OMP_WAIT_POLICY=passive when the variable is not set; a value the user set
// is kept. Costs one exec (about a millisecond) at startup.
void ensure_passive_wait(char** argv);

// The default for -t 0: the cores this process may run on (its affinity mask)
// minus the other processes running right now, at least 1.
int default_threads();

// The cores this process may run on (its affinity mask), at least 1.
int available_cores();

}  // namespace cm::cli
