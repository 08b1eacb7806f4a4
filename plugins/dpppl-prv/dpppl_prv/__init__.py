"""dpppl-prv: the ``prv`` privacy accountant, on Microsoft's prv-accountant."""
