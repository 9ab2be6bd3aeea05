#!/bin/bash

# Use this file to solve the task.
echo two >> /app/words.txt
