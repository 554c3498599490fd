"""The start every distributed worker script of the tests shares, before any tensor exists."""


def start(strategy: str) -> int:
    """Prepares this process for `strategy` and returns its worker index.

    "mirrored" splits the CPU into 2 logical devices; under "multi_worker" the script was started by
    `kerasfast launch` (TF_CONFIG), and `kerasfast.distribute.setup` creates the strategy.
    """
    import tensorflow as tf

    if strategy == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import kerasfast

    kerasfast.distribute.setup()
    return kerasfast.distribute.cluster_from_env().index
