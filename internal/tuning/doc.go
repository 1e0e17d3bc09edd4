// Package tuning checks the engine tuning that 'shardcron server' and
// 'shardcron bench' both take as flags of the same names, with the ranges
// of the engine, the ring and membership, so that the two commands name a
// mistake alike and cannot drift apart. The engine validates its Config
// too, but names its fields, not the flags.
package tuning
