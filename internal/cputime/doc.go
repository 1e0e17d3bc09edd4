// Package cputime reads the CPU time, user and system, that the process or
// the calling thread has used: what a benchmark reports where the machine
// is shared with other work, whose wait for a core leaves wall time
// unreadable. Where the system cannot tell (the process's off Unix, a
// thread's off Linux), it reads 0. It holds no state.
package cputime
