package health

// Check decides from the cache, without claiming anything, whether a call of
// tool may proceed through the pipeline now: it refuses exactly as Admit
// does, except that a half-open circuit passes (the probe is claimed by
// Admit, right before the call executes). The executor checks at lookup time
// (docs/pipeline.md, step 6) so that a replay or a parked call never takes the
// single probe it would not use.
func (t *Tracker) Check(tool string) error {
	h, ok := t.Get(tool)
	if !ok {
		return nil
	}
	_, err := t.judge(h, t.clock())
	return err
}
