"""The step: the DeepSpeed engine, what keeps its step on the device, and the spike guard's judgement."""
