"""Everything that knows object storage (the S3 API): the only place that imports ``boto3``.

``client`` (``S3Client``: one bucket and prefix, the requests, their failure policy and
counting; the one ``boto3`` importer), ``errors`` (what callers catch, stdlib), ``counter``
(requests per operation, bytes, per hour), ``costs`` (what a fleet spends an hour, for
``validate`` and the docs), ``transport`` (the DumbDiLoCo ``Transport`` over an ``S3Client``)
and ``admin`` (the start-up checks and ``storage init``). Importing this package loads none
of them; ``distributed.repos`` builds the transport for an ``s3://bucket/prefix`` repo.
"""
