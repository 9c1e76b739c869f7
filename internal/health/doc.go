// Package health owns tool health (docs/pipeline.md#tool-health): the state machine that turns
// what happened to a call into a tool's health record, the Tracker that keeps
// every record in memory for the executor's admission check, drains and
// restores, and pushes changes to watchers on every replica.
//
// # The state machine
//
// Next is the whole machine; it is pure, so the store can run it under its
// row lock (UpdateToolHealth, FinishCall) and every replica agrees.
//
//   - Only failures that say the tool is unwell count: a ToolError is a
//     transport error, a timeout, a panic or an upstream 5xx. A
//     BusinessFailure (the tool ran and answered success=false) proves the
//     tool responsive, so it counts like a Success.
//   - ToolError: ConsecutiveErrors+1, LastError and LastErrorAt set. At
//     DegradedAfter errors the tool is DEGRADED; at UnavailableAfter the
//     circuit opens ("trips"): UNAVAILABLE, Trips+1, CooldownUntil = now +
//     min(Cooldown·2^(Trips−1), MaxCooldown), ProbeUntil cleared.
//   - While the circuit is open, calls are refused until CooldownUntil; then
//     exactly one call, across all replicas, is let through as the probe: it
//     claims the half-open circuit by setting ProbeUntil (now +
//     ProbeTimeout) through UpdateToolHealth. Every other caller is refused
//     until the probe reports or ProbeUntil passes (a probe whose replica
//     died does not hold the circuit forever).
//   - A failed probe re-opens the circuit at once with the next, doubled,
//     cool-down. A ToolError from a call that is not the probe while the
//     circuit is already open (a straggler admitted before the trip) is
//     counted but does not trip again: otherwise a burst of in-flight
//     failures would push the cool-down to its cap in one go.
//   - Success or BusinessFailure: if anything is off (errors counted, not
//     HEALTHY, a probe or cool-down set, trips counted) the tool becomes
//     HEALTHY with ConsecutiveErrors and Trips 0, cool-down and probe
//     cleared, and LastSuccessAt = now. A success that changes nothing else
//     writes nothing — LastSuccessAt is refreshed only together with another
//     change. That is a deliberate trade: docs/pipeline.md#storage-budget wants no write per call
//     on a healthy tool, so LastSuccessAt means "the last success that
//     changed the tool's health", not the last success.
//   - RateLimited: RateLimitResetsAt becomes the later of the current and
//     the reported reset (a reset already past changes nothing). It is not
//     an error and does not reset the error count. A probe that is rate
//     limited releases the probe, so the next call after the reset probes.
//   - Unreachable (a connector that cannot be started or reached: its
//     server does not start, no session opens): the circuit opens at once,
//     with LastError saying why, and the same reason said again while it is
//     open changes nothing (no write per refused call).
//   - A drained tool stays UNAVAILABLE whatever happens until an operator
//     restores it: observations still update the counters, the last error
//     and the rate limit, but never the status or the circuit.
//
// Every write that changes anything but the probe claim emits one
// audit.HealthChanged event in the same transaction and notifies watchers on
// every replica (HealthUpdate.Notify). Probe claims write ProbeUntil only:
// no event, no notification, and UpdatedAt keeps meaning "when the health
// last changed".
//
// # The Tracker
//
// The executor asks Admit before it touches a tool and applies Change inside
// the call's FinishCall transaction; both read a cache of every health record
// that Start loads and store notifications keep fresh, so the hot path costs
// no query. The store stays the source of truth: Change's function is Next
// applied to the locked record, so a stale cache can at worst skip a write
// that only a success would have made (the tool then heals on the next
// success after the cache catches up).
//
// A replica's own writes reach its cache at once (commit, Record, Set, the
// probe claim); other replicas' writes arrive through TopicHealth
// notifications (and TopicTools ones, since registering or removing a tool
// creates or removes its record). Because two local writes of one tool can
// reach the cache in another order than they reached the store, each local
// write also schedules one read-back of the record; health writes are rare
// (only on change), so this costs a read per change, never one per call.
//
// A probe admitted by Admit that never reaches the tool (refused later in the
// pipeline) should be given back with ReleaseProbe; otherwise it holds the
// half-open circuit until ProbeTimeout.
package health
