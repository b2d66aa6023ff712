"""The notebook panel, split along its seams: ``protocol`` (the kernel <-> page contract),
``payload`` (run -> arrays, pure), ``table`` (health rows, diagnoses, JSON), ``static`` (the image
kept in saved notebooks), ``schedule`` (throttle, analysis thread, polling, cell hook) and
``widget`` (GradientPanel: traits, validation, public API). Nothing is imported here, so that
``gradwidget.panel.protocol`` stays light."""
