"""The command line (``hlofuse``: ``launch``, its console script; ``supervisor``, the light
process that supervises each command's worker; ``main``, the commands) and what it is made of:
file formats, argument specs, the HTML report, the demo, the corpus hook and the settings page
writer. The top layer: nothing in hlofuse imports it."""
