"""The training data: loading, sharding, the tf.data pipeline and TFRecord shards."""
