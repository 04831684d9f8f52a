"""The report's sections: ``base`` (the protocol of a section), ``context`` (the report's paired
core every section is given), ``figures`` (the core's figures), the generic sections
(``decisions``, ``interaction``) and the study's (``study``)."""
