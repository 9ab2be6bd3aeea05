#!/bin/bash
grep -c ERROR /app/access.log > /app/errors.txt
