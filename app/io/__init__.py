"""Files in and out: answer files (``triples``, ``importers``), the saved model file
(``model_file``), the extract job on a file (``extract``), and import/export against a running
service over HTTP (``transfer``). Nothing here imports the service's other layers."""
