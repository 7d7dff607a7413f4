"""The compiled CPU decode step (decode.cpp), its build, and the model description it runs on."""
