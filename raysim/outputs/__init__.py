"""What a run leaves in its directory: config, metrics, TensorBoard events, summary, checkpoints."""
