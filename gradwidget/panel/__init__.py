"""The notebook panel, split along its seams: ``protocol`` (the kernel <-> page contract: every
trait declared once, with its validation; ``_traits`` makes a widget's traits from it), ``payload``
(run -> arrays, pure), ``table`` (health rows, diagnoses, JSON), ``static`` and ``rendition`` (the
static copy kept in saved notebooks), ``schedule`` (throttle, analysis thread, polling, cell hook),
the parts a panel is composed of (``sync``, ``selection``, ``rendition``, ``background``,
``display``, ``compare_widget``) and ``widget`` (GradientPanel and its comparison: the traits, the
public API). Nothing is imported here, so that ``gradwidget.panel.protocol`` stays light."""
