#!/bin/bash

# Use this file to solve the task.
echo one >> /app/words.txt
