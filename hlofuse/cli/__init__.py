"""The command line (``hlofuse``, ``main``) and what it is made of: file formats, argument
specs, the HTML report, the demo, the corpus hook and the settings page writer. The top
layer: nothing in hlofuse imports it."""
