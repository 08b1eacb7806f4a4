"""dpppl-dp-accounting: the ``rdp`` and ``pld`` privacy accountants, on Google's dp_accounting."""
