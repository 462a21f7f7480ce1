"""A release request run and recorded: ``run`` (a ``ReleaseSpec`` through the mechanisms' registry) and
``ReleaseRecord`` (``run``), the accuracy preview before a release (``preview``), the offline path from files
(``offline``), and the noise a recorded release states per n-gram (``uncertainty``)."""
