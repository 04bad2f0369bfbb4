"""The steady-state proof, critical path and breakdown as they were before they read the event log as
arrays (main at b62ec08, verbatim but for these imports): the reference the array versions in
sim/results/ are differential-tested against (tests/test_results_arrays.py). Not for other use. period_path.py
is not here: it was not rewritten, so both sides of the test use sim/results/period_path.py."""
