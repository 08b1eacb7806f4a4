"""Front ends on top of the library: the ``dpppl`` command, the demo, the HTML report and model
files the command reads."""
