"""``lac eval``: reproduce the BayesianDP paper's experiments on real text and evaluate the pipeline.

One module per experiment (``paper_figures``, ``language_model``, ``membership``, ``localizer``,
``pipeline``), shared data (``data``), metrics (``metrics``), plots (``plots``), the Markdown
report (``report``) and the runner (``runner``, ``cli``).
"""
