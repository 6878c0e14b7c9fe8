"""Measuring: inputs, the contract, the implementations, the timers, isolation, rounds, sweep, counters."""
