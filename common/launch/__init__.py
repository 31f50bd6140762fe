"""Starting tasks on hosts: inventories, where each role runs and its command line, tasks tethered to their connection."""
