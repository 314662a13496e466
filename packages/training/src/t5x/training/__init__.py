"""TrainState, T5X Adafactor, schedules, the Trainer and resumable train / eval / infer loops."""
