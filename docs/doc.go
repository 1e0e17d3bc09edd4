// Package docs holds shardcron's design (design.md) and contract (api.md)
// and the tests that keep them true to the code: every task JSON field,
// HTTP route and metric the code defines is named in them, their links
// resolve, and no file of the repository points outside it.
package docs
