"""The suite's own vocabulary: its names, labels and conditions (``names``), the opaque
device configuration claims carry (``gpu_config``), the one sizing rule (``sizing``),
how a validation error reads (``validation``), and a GPU's health as sources report it
(``health``)."""
