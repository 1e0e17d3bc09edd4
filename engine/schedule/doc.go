// Package schedule parses task schedules and computes their fire times.
//
// A schedule is a cron expression with 5 fields (minute hour day-of-month
// month day-of-week, minute resolution) or 6 fields (a leading second), a
// descriptor (@yearly @annually @monthly @weekly @daily @midnight @hourly),
// "@every d", or "@at t" (one fire, at an RFC 3339 time). Cron fields are parsed by github.com/robfig/cron/v3 into its
// bit sets, and fire times follow robfig's matching rules exactly, but are
// found by this package's own allocation-free search over those bit sets
// (robfig's SpecSchedule.Next steps a second at a time, 2-3 µs per fire, and
// gives up after five years). This package adds H fields, @every anchored on
// the Unix epoch, the daylight saving time rule, validation with messages a
// user can act on, and interning.
//
// # Guarantees
//
//   - Parse never panics: panics from robfig/cron are recovered and returned
//     as errors, and inputs known to make it panic (TZ= and CRON_TZ=
//     prefixes) are refused before it sees them.
//   - Every refused input yields a *Error whose message quotes the input, e.g.
//     `"61 * * * * *": second 61 out of range 0-59`.
//   - A schedule that can never fire ("0 0 30 2 *") is refused; one that fires
//     rarely ("0 0 29 2 *", every leap year) is accepted and Next finds its
//     fires however far apart (robfig alone gives up after five years).
//   - Next(t) is the first fire time strictly after t, in UTC, without a
//     monotonic clock reading, or the zero time when there is none (only for
//     times after year 9999). Schedules are immutable and safe for concurrent
//     use; Next does not allocate.
//   - The result depends only on the spec, the time zone's rules and the task
//     id: every node, and every future version of this package, computes the
//     same fire times for the same inputs and tz database. The tz database is
//     the system's, else the copy embedded in the binary (time/tzdata); nodes
//     of one cluster should run the same tz database version.
//
// # Fields
//
//	field         values  names    H range
//	second        0-59             0-59
//	minute        0-59             0-59
//	hour          0-23             0-23
//	day-of-month  1-31             1-28
//	month         1-12    jan-dec  1-12
//	day-of-week   0-6     sun-sat  0-6    (0 is Sunday; 7 is refused)
//
// A field is a comma-separated list of elements: *, ?, a value, a range a-b,
// each optionally followed by /step ("*/15", "10-50/20", "5/15" = "5-59/15"),
// or an H form. As in robfig/cron (and Vixie cron), when both day-of-month
// and day-of-week are restricted (neither starts with * or ?), a day matches
// if either matches; otherwise both must match.
//
// # H: hashed values
//
// H stands for a value derived from the task id, so that many tasks written
// "H * * * *" spread over the hour instead of all firing at :00, and every node
// computes the same value. The rule is part of the contract and never changes:
//
//	h = XXH64(seed 0) of the bytes: task id, 0x00, '0'+i
//
// where i is the field's index in the 6-field form (0 second, 1 minute,
// 2 hour, 3 day-of-month, 4 month, 5 day-of-week; a 5-field spec is
// treated as having a leading second field, so "H * * * *" and "0 H * * * *"
// give the same minute). With [lo, hi] the field's H range from the table
// above:
//
//	H           -> lo + h mod (hi-lo+1)
//	H(a-b)      -> a + h mod (b-a+1)              lo <= a <= b <= hi
//	H/n         -> (lo + h mod n)-hi/n            1 <= n <= hi-lo+1
//	H(a-b)/n    -> (a + h mod n)-b/n              1 <= n <= b-a+1
//
// So minute "H/15" is "7-59/15" (7,22,37,52) for an id whose h mod 15 is 7.
// Several H elements in one field ("H,H(30-59)") all use the same h. The H
// range of day-of-month is 1-28 so that a hashed day exists in every month.
// Resolve returns the spec with every H replaced by its value.
//
// # @every
//
// "@every d" takes a Go duration (time.ParseDuration) of whole seconds, at
// least 1s; "500ms", "1.5s", "0s" and negative intervals are refused, never
// rounded. It fires at the whole multiples of d since the Unix epoch, in any
// time zone: Next(t) = (floor(t/d)+1)*d. So "@every 1h" fires on the hour,
// "@every 90s" at 00:00:00, 00:01:30, ... UTC, and the phase survives
// restarts and hand-offs between nodes.
//
// # @at
//
// "@at t" fires once, at t, an RFC 3339 time of whole seconds
// ("@at 2027-01-01T00:00:00Z"). A time with an offset is that instant,
// whatever the time zone; a time without one ("@at 2027-01-01T09:00:00")
// is a wall-clock time of the time zone, mapped to an instant by the
// daylight saving time rule below. Next(t) is that instant while t is
// before it, and the zero time from then on. At returns the instant.
//
// # Time zones and daylight saving time
//
// A time zone is an IANA name ("Europe/Berlin"), loaded with time.LoadLocation;
// "" means "UTC". "Local" is refused (it differs between machines), and so are
// TZ= and CRON_TZ= prefixes in the spec: the zone belongs in its own field.
// Parse refuses "localtime", "posixrules" and the posix/ and right/ copies
// some hosts' tz databases hold, which the copy in the binary lacks (right/
// zones count leap seconds); a Table interns them where the host has them,
// so that a task written before keeps firing.
// Cron fields are matched against the wall clock of the zone. When the clocks
// change:
//
//   - a wall-clock time that does not exist (spring forward) fires once, at
//     the first instant after the gap: in Europe/Berlin on 2026-03-29,
//     "30 2 * * *" fires at 03:00 CEST, and "*/15 * * * *" fires at 01:45
//     CET, 03:00 CEST (once, for 02:00, 02:15, 02:30, 02:45 and 03:00), 03:15...;
//   - a wall-clock time that occurs twice (fall back) fires once, at its first
//     occurrence: on 2026-10-25, "30 2 * * *" fires at 02:30 CEST only, and
//     "*/15 * * * *" fires at 02:00-02:45 CEST, then not again until 03:00 CET.
//
// # Interning
//
// A Table interns schedules by (resolved spec, zone) and hands out small
// integer handles, so that a million tasks written with one spec share one
// Schedule and task records can hold a Handle instead of a pointer.
package schedule
