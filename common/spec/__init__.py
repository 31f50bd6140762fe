"""What a run is asked to do: the config, the run plan, the memory it may take, the data sets and plug-ins it names, which Keras."""
